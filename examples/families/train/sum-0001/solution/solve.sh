#!/bin/bash
paste -sd+ records.txt | bc > answer.txt
