#!/bin/bash
paste -sd+ list.txt | bc > result.txt
