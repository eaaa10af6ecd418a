#!/bin/bash
paste -sd+ records.txt | bc > final.txt
