#!/bin/bash
paste -sd+ list.txt | bc > total.txt
