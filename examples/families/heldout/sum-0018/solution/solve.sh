#!/bin/bash
paste -sd+ items.txt | bc > total.txt
